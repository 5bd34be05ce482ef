"""The doctor's store checks: Redis answers, it persists what budgets need, this host's clock agrees with it, and a
collector is feeding it.

Why each matters:

- persistence: budget counters and the cloud-spend ledger live only in Redis. Without AOF or RDB a Redis restart
  forgets them, and every team may spend its budget again (FAIL when ``budgets:`` is configured); RDB alone loses
  what was counted since the last snapshot (WARN). The KV index is rebuilt from the engines' replay either way.
- clock: scraped load carries the collector's clock and is judged by each gateway's (``snapshot_max_age_s``), and
  budget windows and reservation leases are cut by each gateway's clock. Each host is compared with Redis's
  ``TIME``: two hosts each within half of ``snapshot_max_age_s`` of Redis are within that bound of each other.
- heartbeat: without a live collector every decision is made on stale state (``state_max_age_s``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.cluster

from cognitora.config import CognitoraConfig
from cognitora.doctor.checks import Check, fail, ok, warn
from cognitora.redaction import redact_url
from kvstate.open import open_store
from kvstate.redis_client import probe
from kvstate.store import StoreRefused, StoreUnavailable

__all__ = [
    "CLOCK_WARN_S",
    "clock_sync_check",
    "collector_check",
    "redis_checks",
]

CLOCK_WARN_S = 0.5
"""A skew from Redis above this is reported: budget windows near their edges start to disagree between gateways."""

Client = redis.Redis | redis.cluster.RedisCluster


def redis_checks(config: CognitoraConfig, timeout_s: float) -> list[Check]:
    """Reachability, persistence and clock against Redis; one OK line when there is no ``redis_url``."""
    url = config.redis_url
    if url is None:
        return [ok("redis", "no redis_url: the in-process store (one gateway process, nothing to check)")]
    shown = redact_url(url)
    try:
        probe(url, cluster=config.redis_cluster, timeout_s=timeout_s)
    except StoreRefused as exc:
        return [fail("redis", f"{shown}: {exc}", "fix redis_url (or the server's ACL); the password is never shown")]
    except StoreUnavailable as exc:
        return [
            fail(
                "redis",
                f"{shown}: {exc}",
                "start Redis, or correct redis_url; gateways run degraded (no shared state) until it answers",
            )
        ]
    client = _client(url, config.redis_cluster, timeout_s)
    try:
        version = _per_node(client.info("server")) if not config.redis_cluster else {}
        detail = f"{shown} answers" + (f" (Redis {version.get('redis_version')})" if version else "")
        if config.redis_cluster:
            detail += f" (Redis Cluster, {len(client.get_primaries())} primaries)"  # type: ignore[union-attr]
        return [ok("redis", detail), _persistence(client, config), _clock_against_redis(client, config)]
    except redis.RedisError as exc:
        return [fail("redis", f"{shown} answered PING, then failed: {exc}", "see the Redis server's log")]
    finally:
        client.close()


def _client(url: str, cluster: bool, timeout_s: float) -> Client:
    if cluster:
        return redis.cluster.RedisCluster.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


def _per_node(reply: Any) -> dict[str, Any]:
    """One node's reply; a Cluster client's reply to a command sent to several nodes is a dict by node."""
    if isinstance(reply, dict) and reply and all(isinstance(v, dict) for v in reply.values()):
        return dict(next(iter(reply.values())))
    return dict(reply)


def _each_primary(client: Client, command: Callable[..., Any]) -> list[Any]:
    if isinstance(client, redis.cluster.RedisCluster):
        replies = command(target_nodes=redis.cluster.RedisCluster.PRIMARIES)
        return list(replies.values()) if isinstance(replies, dict) else [replies]
    return [command()]


def _persistence(client: Client, config: CognitoraConfig) -> Check:
    name = "redis persistence"
    try:
        appendonly = [
            str(r.get("appendonly", ""))
            for r in _each_primary(client, lambda **kw: client.config_get("appendonly", **kw))
        ]
        save = [str(r.get("save", "")) for r in _each_primary(client, lambda **kw: client.config_get("save", **kw))]
        fsync = [
            str(r.get("appendfsync", ""))
            for r in _each_primary(client, lambda **kw: client.config_get("appendfsync", **kw))
        ]
    except redis.ResponseError:  # CONFIG renamed or disabled (managed Redis): INFO still tells whether AOF is on
        infos = _each_primary(client, lambda **kw: client.info("persistence", **kw))
        if all(int(_per_node(i).get("aof_enabled", 0)) == 1 for i in infos):
            return ok(name, "AOF on (read from INFO; CONFIG is disabled on this server)")
        return warn(
            name,
            "AOF is off and the RDB schedule cannot be read (CONFIG is disabled on this server)",
            "make sure the server persists: appendonly yes, appendfsync everysec (budget counters live in Redis)",
        )
    budgets = config.budgets is not None
    if all(a == "yes" for a in appendonly):
        return ok(name, f"AOF on (appendfsync {fsync[0] or '?'}){_rdb_note(save)}")
    if all(save):
        return warn(
            name,
            f"RDB snapshots only (save {save[0]!r}): a crash loses what was counted since the last snapshot",
            "appendonly yes and appendfsync everysec in redis.conf (CONFIG SET appendonly yes applies it live)",
        )
    fix = "appendonly yes and appendfsync everysec in redis.conf (CONFIG SET appendonly yes applies it live)"
    if budgets:
        what = "a Redis restart forgets every budget counter and the cloud-spend ledger: teams could spend twice"
        return fail(name, f"no AOF and no RDB snapshots: {what}", fix)
    what = (
        "a Redis restart forgets the shared state (no budgets are configured; the KV index is rebuilt from the engines)"
    )
    return warn(name, f"no AOF and no RDB snapshots: {what}", fix)


def _rdb_note(save: list[str]) -> str:
    return f", RDB snapshots too (save {save[0]!r})" if all(save) else ""


def _clock_against_redis(client: Client, config: CognitoraConfig) -> Check:
    name = "clock"
    before = time.time()
    reply = client.time()
    after = time.time()
    seconds, micros = next(iter(reply.values())) if isinstance(reply, dict) else reply
    offset = seconds + micros / 1e6 - (before + after) / 2
    bound = min(config.placement.snapshot_max_age_s, config.placement.state_max_age_s) / 2
    direction = "behind" if offset > 0 else "ahead of"
    detail = (
        f"this host's clock is {abs(offset) * 1000:.0f} ms {direction} Redis's TIME (+-{(after - before) * 500:.0f} ms)"
    )
    fix = "run NTP on every host (chrony or systemd-timesyncd): timedatectl set-ntp true"
    if abs(offset) >= bound:
        return fail(
            name,
            f"{detail}: at least half of snapshot_max_age_s/state_max_age_s ({2 * bound:g} s), so another host's "
            "scraped load can look stale (or too fresh) here",
            fix,
        )
    if abs(offset) >= CLOCK_WARN_S:
        return warn(name, f"{detail}: budget windows and leases near their edges disagree between hosts", fix)
    return ok(name, detail)


_TIME_ERROR = 5
"""adjtimex(2)'s answer when the kernel's clock is not synchronized (no NTP discipline)."""


def clock_sync_check() -> Check:
    """Whether the kernel says this clock is synchronized (Linux ``adjtimex``, read-only). Other systems: not
    checked (an OK line says so)."""
    name = "clock sync"
    if not sys.platform.startswith("linux"):
        return ok(name, f"not checked on {sys.platform} (Linux's adjtimex only)")
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return ok(name, "not checked (no C library found to ask the kernel)")
    timex = ctypes.create_string_buffer(512)  # struct timex, zeroed: modes 0 reads without changing anything
    state = ctypes.CDLL(libc_name, use_errno=True).adjtimex(timex)
    if state == _TIME_ERROR:
        return warn(
            name,
            "the kernel reports this clock as not synchronized (no NTP daemon disciplines it)",
            "enable NTP: timedatectl set-ntp true (systemd-timesyncd) or install chrony",
        )
    if state < 0:
        return ok(name, f"not checked (adjtimex failed: errno {ctypes.get_errno()})")
    return ok(name, "the kernel reports this clock as synchronized (NTP)")


async def collector_check(config: CognitoraConfig) -> Check | None:
    """The newest collector heartbeat in the store (None without ``redis_url``: the gateway's ``--collector`` runs
    in its own process, and Redis's own failures are reported by ``redis_checks``)."""
    if config.redis_url is None:
        return None
    name = "collector"
    store = open_store(config.redis_url, config.key_prefix, config.redis_cluster)
    try:
        beats = await store.heartbeats()
    except StoreUnavailable:
        return None  # the redis check says why
    finally:
        await store.close()
    run = "run `cognitora collector --config <this file>` once for the fleet (systemd: cognitora-collector.service)"
    if not beats:
        return warn(name, f"no collector heartbeat under key prefix {config.key_prefix!r}", run)
    who, beat = min(beats.items(), key=lambda item: item[1].age_s)
    bound = config.placement.state_max_age_s
    if beat.age_s > bound:
        return fail(
            name,
            f"the newest heartbeat ({who}) is {beat.age_s:.0f} s old, above state_max_age_s {bound:g} s: decisions "
            "are made on stale state",
            f"restart the collector, or {run}",
        )
    return ok(name, f"{who} beat {beat.age_s:.1f} s ago ({len(beats)} collector(s) seen)")
