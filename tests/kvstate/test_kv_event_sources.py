"""Discovery of vLLM's KV-event streams from its ``GET /kv_event_sources`` (``cognitora.kv_event_sources``):
the answer parsed rank by rank, a watcher that follows a restarted engine's new ports, and the collector feeding the
store from a simulated fleet whose config names no ``kv_events`` at all. (Against a real vLLM 0.32:
``tests/real_engines/test_vllm_engine_e2e.py``.)"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from cognitora.collector import Collector
from cognitora.config import CognitoraConfig, EndpointConfig, EngineKind
from cognitora.core.router import Router
from cognitora.kv_event_sources import KvEventSource, KvEventSourceWatcher, discovers_kv_events, sources_from
from cognitora.request import RouteRequest
from cognitora_sim.launch import start_fleet
from kvstate.memory_store import MemoryStore

REAL_VLLM_032_ANSWER = {
    "0": {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:18201",
        "replay_endpoint": "tcp://*:18202",
        "buffer_steps": 10000,
        "hwm": 100000,
        "max_queue_size": 100000,
        "topic": "",
    }
}
"""What a real vLLM 0.32.0 answered, started with ``--kv-events-config`` naming ``tcp://*:18201`` and its replay."""


def test_a_wildcard_bind_is_reached_at_the_engines_host() -> None:
    sources, problems = sources_from(REAL_VLLM_032_ANSWER, "http://10.0.0.5:8000")
    assert sources == [KvEventSource(0, "tcp://10.0.0.5:18201", "tcp://10.0.0.5:18202")]
    assert problems == []


def test_every_data_parallel_rank_is_a_source_and_unusable_ones_are_named() -> None:
    rank = REAL_VLLM_032_ANSWER["0"]
    body = {
        "0": rank,
        "1": {**rank, "endpoint": "tcp://*:18202", "replay_endpoint": None},  # vLLM offsets each rank's port
        "2": {**rank, "endpoint": "inproc://cache_dp2"},
        "3": {**rank, "enable_kv_cache_events": False, "publisher": "null"},
    }
    sources, problems = sources_from(body, "http://[fd00::5]:8000")
    assert sources == [
        KvEventSource(0, "tcp://[fd00::5]:18201", "tcp://[fd00::5]:18202"),
        KvEventSource(1, "tcp://[fd00::5]:18202", None),
    ]
    assert len(problems) == 2 and "rank 2" in problems[0] and "rank 3" in problems[1], problems
    # An address that is not a wildcard (vLLM resolved tcp://*:0 to the node's IP) is used as written.
    resolved, _ = sources_from({"0": {**rank, "endpoint": "tcp://10.1.2.3:41000"}}, "http://engine:8000")
    assert resolved[0].publisher == "tcp://10.1.2.3:41000"


@pytest.mark.parametrize("body", [[], {"x": {}}, {"0": "tcp://*:1"}])
def test_an_answer_of_another_shape_is_refused_with_the_reason(body: Any) -> None:
    with pytest.raises(ValueError):
        sources_from(body, "http://127.0.0.1:8000")


def test_only_vllm_endpoints_without_kv_events_are_discovered() -> None:
    assert discovers_kv_events(EndpointConfig(url="http://a:1"))
    assert not discovers_kv_events(EndpointConfig(url="http://a:1"), enabled=False)
    assert not discovers_kv_events(EndpointConfig(url="http://a:1", kv_events="tcp://a:5557"))
    assert not discovers_kv_events(EndpointConfig(url="http://a:1", engine=EngineKind.SGLANG))


async def test_the_watcher_follows_a_restarted_engines_new_ports(caplog: pytest.LogCaptureFixture) -> None:
    answers: list[tuple[int, object]] = []
    """The engine's current answer: status, JSON body."""

    async def handler(request: web.Request) -> web.Response:
        status, body = answers[0]
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_get("/kv_event_sources", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    seen: list[list[KvEventSource]] = []

    async def on_change(sources: list[KvEventSource]) -> None:
        seen.append(sources)

    watcher = KvEventSourceWatcher("engine", f"http://127.0.0.1:{port}", on_change)
    try:
        async with httpx.AsyncClient(timeout=2) as client:
            answers[:] = [(200, REAL_VLLM_032_ANSWER)]
            await watcher.read_once(client)
            await watcher.read_once(client)  # the same answer: nothing to do
            assert seen == [[KvEventSource(0, "tcp://127.0.0.1:18201", "tcp://127.0.0.1:18202")]]
            answers[:] = [(503, {})]  # restarting: the current streams are kept
            await watcher.read_once(client)
            assert len(seen) == 1 and watcher.failures == 1
            moved = {"0": {**REAL_VLLM_032_ANSWER["0"], "endpoint": "tcp://*:19001", "replay_endpoint": None}}
            answers[:] = [(200, moved)]
            await watcher.read_once(client)
            assert seen[-1] == [KvEventSource(0, "tcp://127.0.0.1:19001", None)]
            answers[:] = [(404, {})]  # an older vLLM: said once, in words an operator can act on
            with caplog.at_level(logging.WARNING):
                await watcher.read_once(client)
                await watcher.read_once(client)
            # the watcher's own words (an earlier test may leave aiohttp's access log on, at INFO)
            said = [
                r.getMessage()
                for r in caplog.records
                if r.name == "cognitora.kv_event_sources" and "kv_event_sources" in r.getMessage()
            ]
            assert len(said) == 1 and "set kv_events" in said[0], said
    finally:
        await runner.cleanup()


async def test_the_collector_subscribes_to_what_a_sim_engine_says(tmp_path: Path, smollm2_dir: Path) -> None:
    with start_fleet(2, tokenizer=smollm2_dir / "tokenizer.json", log_dir=tmp_path) as fleet:
        config = CognitoraConfig.model_validate(
            {
                "models": [
                    {
                        "name": fleet.model,
                        "block_size": 16,
                        "tokenizer": str(smollm2_dir / "tokenizer.json"),
                        "chat_template": str(smollm2_dir / "chat_template.jinja"),
                        "endpoints": [{"url": url} for url in fleet.urls],  # no kv_events: discovered
                    }
                ],
                "engine_pulls": {"vllm_kv_event_sources_interval_s": 0.2},
            }
        )
        store = MemoryStore()
        collector = Collector(config, store)
        router = Router(config, store)
        messages = [{"role": "system", "content": "Shared notes. " * 200}, {"role": "user", "content": "a?"}]
        try:
            await collector.start()
            async with httpx.AsyncClient(timeout=30) as client:
                r = await client.post(
                    f"{fleet.urls[1]}/v1/chat/completions",
                    json={"model": fleet.model, "messages": messages, "max_tokens": 1},
                )
                assert r.status_code == 200, r.text
            ask = [*messages[:1], {"role": "user", "content": "b?"}]
            cached = 0.0
            for _ in range(100):
                decision = await router.place(RouteRequest(model=fleet.model, messages=ask))
                cached = {c.endpoint: c.cached_tokens for c in decision.candidates}.get(fleet.endpoint_ids[1], 0.0)
                if cached >= 512:
                    break
                await asyncio.sleep(0.1)
            assert cached >= 512, decision.explain()
            assert sorted(collector.discovered) == sorted(fleet.endpoint_ids)
            assert collector.stats()["blocks_stored"] > 0
        finally:
            await collector.stop()
            await router.close()
