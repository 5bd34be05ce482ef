"""Router benchmark: what one placement costs a gateway, end to end and by part.

    .venv/bin/python -m bench.router_bench --redis-url redis://127.0.0.1:6379/0

For 2k- and 8k-token chats (SmolLM2 tokenizer and chat template, block size 16) over a model with 16 endpoints, 4
of which hold the chat's system prompt and 1 the whole chat, every endpoint with a snapshot, and a scraper writing
each endpoint's snapshot once a second (through its own store, as the collector does):

- ``Router.place`` end to end (keys + the store read + placement), on ``MemoryStore`` and ``RedisStore``;
- on Redis, the same side by side, interleaved sample by sample: the router reading the fleet with the three calls
  it used to make concurrently (``match_prefix``, ``inflight``, ``snapshots``: three round trips) against one
  ``fleet_view`` (two scripts, one per hash slot, in one pipelined round trip), and those store reads alone;
- the Router's other parts alone: tokenizing and keying the chat, and ``placement.place`` (the pure decision, state
  already fetched).

Wall time and the benchmark thread's own CPU time per call (on a shared machine the wall-clock tail is mostly time
spent preempted, which own CPU excludes; for Redis it is the client side only). Same run, same machine: compare
rows with each other, not with other machines. Writes ``<out>/router_bench.md``. Redis keys go under a fresh
prefix, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import platform
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from cognitora.config import CognitoraConfig, config_from_dict
from cognitora.core.router import Router
from cognitora.placement import FleetState, place
from cognitora.request import RouteRequest
from cognitora_sim.tokenizer import SMOLLM2_DIR
from kvstate.keys import BlockKey
from kvstate.memory_store import MemoryStore
from kvstate.prompt import ChatTokenizer, PromptKeyer
from kvstate.redis_store import RedisStore
from kvstate.store import EndpointSnapshot, FleetView, Store

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = SMOLLM2_DIR
MODEL = "smollm2"
ENDPOINTS = [f"10.0.0.{i}:8000" for i in range(1, 17)]
SCRAPE_INTERVAL_S = 1.0


def make_config() -> CognitoraConfig:
    return config_from_dict(
        {
            "models": [
                {
                    "name": MODEL,
                    "tokenizer": str(SMOLLM2 / "tokenizer.json"),
                    "endpoints": [{"url": f"http://{e}"} for e in ENDPOINTS],
                }
            ],
            "placement": {"store_timeout_s": 5.0},
        }
    )


def chat(tokens: int) -> RouteRequest:
    # ~1.2 tokens per word of this text with the SmolLM2 tokenizer; the exact count is printed
    system = " ".join(f"Rule {i}: answer carefully, cite the section, keep it short." for i in range(tokens // 14))
    return RouteRequest(
        model=MODEL,
        messages=[{"role": "system", "content": system}, {"role": "user", "content": "Which rule covers refunds?"}],
    )


@dataclass
class Samples:
    wall_ms: list[float]
    cpu_ms: list[float]


async def timed_together(fns: Sequence[Callable[[], Awaitable[Any]]], n: int) -> list[Samples]:
    """Each of ``fns`` ``n`` times, interleaved call by call, so load on the shared machine hits them alike."""
    for _ in range(min(20, n)):
        for fn in fns:
            await fn()
    out = [Samples([], []) for _ in fns]
    for _ in range(n):
        for fn, samples in zip(fns, out, strict=True):
            c0 = time.thread_time()
            t0 = time.perf_counter()
            await fn()
            samples.wall_ms.append((time.perf_counter() - t0) * 1000)
            samples.cpu_ms.append((time.thread_time() - c0) * 1000)
    return out


async def timed(fn: Callable[[], Awaitable[Any]], n: int) -> Samples:
    return (await timed_together([fn], n))[0]


def pct(samples: list[float], p: int) -> float:
    return statistics.quantiles(samples, n=100)[p - 1]


def row(name: str, s: Samples) -> str:
    w, c = s.wall_ms, s.cpu_ms
    cpu = f"{pct(c, 50):.2f} | {pct(c, 99):.2f}" if c else " | "
    return f"| {name} | {len(w)} | {pct(w, 50):.2f} | {pct(w, 90):.2f} | {pct(w, 99):.2f} | {cpu} |"


def ratio_row(name: str, before: Samples, after: Samples) -> str:
    parts = [pct(after.wall_ms, p) / pct(before.wall_ms, p) for p in (50, 90, 99)]
    cpu = [pct(after.cpu_ms, p) / pct(before.cpu_ms, p) for p in (50, 99)]
    cells = " | ".join(f"{r:.2f}x" for r in [*parts, *cpu])
    return f"| {name}: after / before | | {cells} |"


class ThreeReads:
    """A store whose ``fleet_view`` is the three reads the router made before ``fleet_view`` existed, concurrently
    on the store's connection pool (three round trips). Everything else is the wrapped store's."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def fleet_view(
        self, model: str, keys: Sequence[BlockKey], endpoints: Sequence[str], **_: object
    ) -> FleetView:  # (no checkpoints: as before fleet_view existed)
        async def no_match() -> dict[str, Any]:
            return {}

        store = self._store
        matches, inflight, snapshots = await asyncio.gather(
            store.match_prefix(model, keys, endpoints) if keys else no_match(),
            store.inflight(endpoints),
            store.snapshots(endpoints),
        )
        return FleetView(matches, inflight, snapshots)


def timed_script(source: str) -> str:
    """A ``fleet_view`` script returning its own run time in microseconds (the Redis server's clock) instead of
    its reply: its last line, ``return ...``, is replaced by the timing."""
    head, body = source.split("\n", 1)
    lines = body.rstrip().split("\n")
    assert head.startswith("#!lua") and lines[-1].startswith("return "), "a fleet_view script changed shape"
    start = "local __t = redis.call('TIME')\nlocal __t0 = tonumber(__t[1]) * 1000000 + tonumber(__t[2])\n"
    end = "local __u = redis.call('TIME')\nreturn tonumber(__u[1]) * 1000000 + tonumber(__u[2]) - __t0\n"
    return head + "\n" + start + "\n".join(lines[:-1]) + "\n" + end


async def bench_script(store: RedisStore, keys: list[BlockKey], n: int) -> list[str]:
    """The ``fleet_view`` scripts' run time inside redis-server (the match and the fleet state, summed per call):
    the part the client cannot speed up."""
    client = aioredis.Redis.from_url(store.url)
    try:
        await store.fleet_view(MODEL, keys, ENDPOINTS)  # holds the current snapshots now
        rows = []
        for label, current in (("snapshots current", True), ("snapshots sent", False)):
            calls = []
            for source, zkeys, args in store.fleet_view_script_calls(MODEL, keys, ENDPOINTS, current):
                calls.append((await client.script_load(timed_script(source)), zkeys, args))
            samples = []
            for _ in range(n):
                total = 0
                for sha, zkeys, args in calls:
                    total += int(await client.evalsha(sha, len(zkeys), *zkeys, *args))
                samples.append(total / 1000)
            rows.append(row(f"fleet_view scripts alone, redis-server clock ({label})", Samples(samples, [])))
    finally:
        await client.aclose()
    return rows


def snapshot(endpoint: str, now: float) -> EndpointSnapshot:
    return EndpointSnapshot(
        endpoint,
        last_seen=now,
        running=3,
        waiting=0,
        kv_usage=0.4,
        prefill_tokens_per_s=12000.0,
        decode_tokens_per_s=900.0,
        power_watts=300.0,
        energy_joules=now,
        block_size=16,
        prompt_tokens_total=now,
        generation_tokens_total=now / 10,
    )


@contextlib.asynccontextmanager
async def scraper(store: Store) -> AsyncIterator[None]:
    """Writes every endpoint's snapshot once per ``SCRAPE_INTERVAL_S``, one endpoint at a time, as the collector."""

    async def scrape() -> None:
        while True:
            for e in ENDPOINTS:
                await store.put_snapshot(snapshot(e, time.time()))
                await asyncio.sleep(SCRAPE_INTERVAL_S / len(ENDPOINTS))

    task = asyncio.create_task(scrape())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def seed(store: Store, router: Router, req: RouteRequest) -> None:
    keys = list((await router.place(req)).keys)
    system_part = keys[: max(1, len(keys) - 2)]
    for e in ENDPOINTS[:4]:
        await store.add_blocks(MODEL, e, system_part)
    await store.add_blocks(MODEL, ENDPOINTS[4], keys)
    for e in ENDPOINTS:
        await store.put_snapshot(snapshot(e, time.time()))


async def placing_router(config: CognitoraConfig, store: Store, req: RouteRequest) -> tuple[Router, str]:
    router = Router(config, store)
    decision = await router.place(req)
    # one of the endpoints holding the prompt (which one is placement's business: ties, affinity)
    assert decision.endpoint in ENDPOINTS[:5] and not decision.degraded, decision.explain()
    return router, f"{decision.prompt_tokens} tokens / {len(decision.keys)} keys"


async def bench_memory(config: CognitoraConfig, req: RouteRequest, n: int) -> list[str]:
    store = MemoryStore()
    await seed(store, Router(config, store), req)
    router, size = await placing_router(config, store, req)
    return [row(f"Router.place, memory, {size}", await timed(lambda: router.place(req), n))]


async def bench_redis(config: CognitoraConfig, store: RedisStore, req: RouteRequest, n: int) -> list[str]:
    await seed(store, Router(config, store), req)
    before, size = await placing_router(config, ThreeReads(store), req)  # type: ignore[arg-type]
    after, _ = await placing_router(config, store, req)
    old, new = await timed_together([lambda: before.place(req), lambda: after.place(req)], n)
    keys = list((await after.place(req)).keys)
    three = ThreeReads(store)
    reads_old, reads_new = await timed_together(
        [lambda: three.fleet_view(MODEL, keys, ENDPOINTS), lambda: store.fleet_view(MODEL, keys, ENDPOINTS)], n
    )
    script = await bench_script(store, keys, n)
    return [
        row(f"Router.place, redis, three reads (before), {size}", old),
        row(f"Router.place, redis, fleet_view (after), {size}", new),
        ratio_row("Router.place, redis", old, new),
        row("store reads only, three reads (before)", reads_old),
        row("store reads only, fleet_view (after)", reads_new),
        ratio_row("store reads only", reads_old, reads_new),
        *script,
    ]


async def bench_parts(config: CognitoraConfig, req: RouteRequest, n: int) -> list[str]:
    """The router's own parts: the prompt's keys, and the pure decision over the state it would fetch."""
    store = MemoryStore()
    await seed(store, Router(config, store), req)
    keyer = PromptKeyer(MODEL, 16, ChatTokenizer(SMOLLM2 / "tokenizer.json"))
    prompt = keyer.keys_for_chat(req.messages or [])
    view = await store.fleet_view(MODEL, prompt.keys, ENDPOINTS)
    state = FleetState(now=time.time(), matches=view.matches, inflight=view.inflight, snapshots=view.snapshots)

    async def pure() -> None:
        place(req, prompt, config, state)

    async def keys_only() -> None:
        keyer.keys_for_chat(req.messages or [])

    return [
        row(f"tokenize + block keys only, {prompt.prompt_tokens} tokens", await timed(keys_only, n)),
        row(f"placement.place only, 16 endpoints, {prompt.prompt_tokens} tokens", await timed(pure, n)),
    ]


async def run(redis_url: str, n: int) -> list[str]:
    config = make_config()
    lines = [
        "| what | n | p50 ms | p90 ms | p99 ms | own CPU p50 ms | own CPU p99 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    prefix = f"routerbench-{uuid.uuid4().hex[:8]}"
    store = RedisStore.from_url(redis_url, key_prefix=prefix)
    collector = RedisStore.from_url(redis_url, key_prefix=prefix)
    try:
        async with scraper(collector):
            for tokens in (2048, 8192):
                req = chat(tokens)
                lines.extend(await bench_memory(config, req, n))
                lines.extend(await bench_redis(config, store, req, n))
                lines.extend(await bench_parts(config, req, n))
    finally:
        await store.delete_everything()
        await store.close()
        await collector.close()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("-n", type=int, default=500, help="samples per row")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    lines = asyncio.run(run(args.redis_url, args.n))
    load_end = os.getloadavg()[0]
    text = "\n".join(
        [
            "# Router benchmark",
            "",
            f"Command: `.venv/bin/python -m bench.router_bench --redis-url {args.redis_url} -n {args.n}`",
            "",
            f"Run at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())} on {platform.machine()}, "
            f"{os.cpu_count()} cores, CPython {platform.python_version()}; load average (1 min) {load_start:.1f} at "
            f"start, {load_end:.1f} at end. The machine is shared with other jobs: compare rows of this run with each "
            "other (before and after are interleaved sample by sample), not with other runs.",
            "",
            "16 endpoints, every one with a snapshot, rewritten one endpoint at a time once a second by a scraper "
            "on its own store (as the collector does). *Three reads (before)*: the router's store read as it was, "
            "`match_prefix`, `inflight` and `snapshots` concurrently (three round trips). *fleet_view (after)*: two "
            "scripts (the match in the model's hash slot, the fleet state in the fleet's) in one pipelined round "
            "trip, snapshots resent only when one changed. *Own CPU*: this thread's CPU time per call "
            "(client side only for Redis; the script runs in redis-server).",
            "",
            *lines,
            "",
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "router_bench.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
