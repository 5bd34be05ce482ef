"""A collector reload that changes only the scrape settings keeps the KV-event streams discovered from a vLLM
engine's ``/kv_event_sources`` (``cognitora.ops.collector_reload.carry_over``): no purge, no replay, the same
subscriber applying the next live batch. Before, every discovered engine was purged and replayed for nothing. When
the engine later names other sockets (a restart on other ports), the new watcher still replaces the kept stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import zmq.asyncio
from aiohttp import web

from cognitora.collector import Collector
from cognitora.config import load_config
from cognitora.ops.collector_reload import LiveCollector
from cognitora.ops.reload import ConfigSource
from kvstate.keys import chain_block_keys, root_key
from kvstate.memory_store import MemoryStore
from tests.support.events_fake_engine import MODEL, FakeEngine, blocks_of, envelope, eventually, vllm_stored_map

CHAIN = blocks_of(100, 3)


def batch(i: int) -> bytes:
    return envelope([vllm_stored_map([i + 1], i if i else None, CHAIN[i * 16 : (i + 1) * 16])])


@pytest.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    ctx = zmq.asyncio.Context()
    fake = FakeEngine(ctx, replay="topic")
    yield fake
    await fake.close()
    ctx.destroy(linger=0)


@pytest.fixture
def named(engine: FakeEngine) -> list[FakeEngine]:
    """The engine whose sockets ``/kv_event_sources`` names (a test swaps it)."""
    return [engine]


@pytest.fixture
async def sources_url(named: list[FakeEngine]) -> AsyncIterator[str]:
    """An engine's HTTP side answering ``/kv_event_sources`` as vLLM 0.32 does, naming ``named[0]``'s sockets."""

    async def handler(request: web.Request) -> web.Response:
        rank0 = {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://*:{named[0].pub_port}",
            "replay_endpoint": f"tcp://*:{named[0].replay_port}",
        }
        return web.json_response({"0": rank0})

    app = web.Application()
    app.router.add_get("/kv_event_sources", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    await runner.cleanup()


def config(url: str, scrape_interval_s: float) -> dict[str, Any]:
    return {
        "models": [{"name": MODEL, "block_size": 16, "endpoints": [{"url": url, "id": "ep", "engine": "vllm"}]}],
        "scrape": {"interval_s": scrape_interval_s},
        "engine_pulls": {"vllm_kv_event_sources_interval_s": 0.1},
    }


async def test_a_scrape_only_reload_keeps_the_discovered_streams(
    tmp_path: Path, engine: FakeEngine, named: list[FakeEngine], sources_url: str
) -> None:
    store = MemoryStore()

    async def held() -> int:
        keys = chain_block_keys(root_key(MODEL, None), CHAIN, 16)
        match = await store.match_prefix(MODEL, keys, ["ep"])
        return match["ep"].blocks if "ep" in match else 0

    path = tmp_path / "cognitora.yaml"
    path.write_text(json.dumps(config(sources_url, 1.0)))
    live = LiveCollector(Collector(load_config(path), store), ConfigSource.file(path))
    for i in range(2):
        await engine.publish(batch(i), deliver=False)
    await live.current.start()
    try:

        async def two_held() -> bool:
            return await held() == 2

        await eventually(two_held, "the discovered stream's replay to reach the store")
        await engine.wait_subscribed()
        (stream,) = live.current.discovered["ep"]
        assert engine.replay_requests == [0]

        path.write_text(json.dumps(config(sources_url, 2.0)))
        outcome = await live.reload()
        assert outcome.ok and outcome.changed == ("scrape",), outcome
        assert live.current.discovered["ep"] == [stream]
        watcher = live.current.source_watchers["ep"]
        reads = watcher.reads

        async def read_twice() -> bool:
            return watcher.reads >= reads + 2

        await eventually(read_twice, "the new watcher to read the engine's sources twice")
        assert live.current.discovered["ep"] == [stream]  # the same sources: nothing to change
        assert engine.replay_requests == [0] and stream.stats.purges == 0, stream.stats
        await engine.publish(batch(2))

        async def three_held() -> bool:
            return await held() == 3

        await eventually(three_held, "the kept stream to apply the next live batch")

        moved = FakeEngine(engine.ctx, replay="topic")  # the engine restarted on other ports
        try:
            named[0] = moved

            async def resubscribed() -> bool:
                found = live.current.discovered.get("ep")  # absent while the watcher swaps the streams
                return found is not None and found != [stream] and moved.replay_requests == [0]

            await eventually(resubscribed, "the new watcher to follow the engine to its new ports")
        finally:
            await moved.close()
    finally:
        await live.current.stop()
